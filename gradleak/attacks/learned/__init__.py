"""The learned inverter: a network trained on auxiliary data to invert defended updates; also the
optimisation attacks' `init=learned` start."""
