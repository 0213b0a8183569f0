"""One attack scenario's pieces, below the run (`gradleak.run.experiment`): its spec and result
(`spec`), its assembly from names and the checks before a run (`assembly`), the
re-identification gallery (`gallery`) and the result files and store record (`outputs`). The
dead-model check is the model's own (`gradleak.models.model_check`)."""
