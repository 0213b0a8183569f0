"""The shared optimisation engine: what is optimised (candidates), against what (objectives), from where
(initialization, generators), and the loop (engine). Builds on the replay family."""
