"""Gradient-matching attacks, each a configuration of the engine: dlg, ig, cpl, rog, gradinversion,
fedavg, feature_prior (with its server-side probe layer, feature_probe)."""
