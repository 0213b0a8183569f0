"""The one run pipeline: a scenario's spec, its assembly from names and its gallery (`scenario`),
one scenario end to end through `attack_observations` (`experiment`), the auditor's budget
ladder that each attack climbs there (`ladder`), and one attack on an in-memory batch through
the same pipeline (`batch_attack`). Every path that attacks — `gradleak attack`, sweeps,
`gradleak.audit`, `audit_update`, the Flower audit and the guard — runs through here."""
