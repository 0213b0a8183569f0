"""Reconstruction quality: matched to the ground truth, then scored."""
from .image import mse, psnr, ssim
from .scoring import ASR_MSE_THRESHOLD, ExampleScore, match_reconstruction, score_batch, summarize

__all__ = ["mse", "psnr", "ssim", "ExampleScore", "match_reconstruction", "score_batch", "summarize",
           "ASR_MSE_THRESHOLD"]
