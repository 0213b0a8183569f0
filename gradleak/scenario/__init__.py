"""One attack scenario's pieces, below the run (`gradleak.experiment`): its spec and result
(`spec`), its assembly from names and the checks before a run (`assembly`), the
re-identification gallery (`gallery`), the dead-model check (`model_check`) and the result
files and store record (`outputs`)."""
