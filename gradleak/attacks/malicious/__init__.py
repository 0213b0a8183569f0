"""Malicious-server attacks, which send a crafted model: rtf, loki (rtf's bins kept decodable
over local training), mkor (mkor_crafting, mkor_decoding), fishing (which inverts the isolated
gradient with fc_analytic or ig)."""
