"""Attacks on language models: tag, lamp (on tag's embedding matching), dager (dager_attack dispatches to
the decoder search in dager and the encoder search in dager_encoder)."""
