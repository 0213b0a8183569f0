"""`attack_batch` observes the batch with the modality its tensors declare (or the one given),
never an image by default."""
import torch

from gradleak.run.batch_attack import attack_batch


def test_feature_rows_are_scored_as_rows_and_pictures_as_pictures():
    rows = attack_batch("dlg:iterations=2", "mlp", torch.rand(2, 6), torch.tensor([0, 1]), 2)
    assert rows.metrics["mse"] is not None and rows.metrics["psnr"] is None  # tabular: MSE alone
    pictures = attack_batch("dlg:iterations=2", "mlp", torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), 2)
    assert pictures.metrics["psnr"] is not None
    declared = attack_batch("dlg:iterations=2", "mlp", torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), 2,
                            modality="tabular")
    assert declared.metrics["psnr"] is None
