"""Image postprocessing applied to reconstructions (ROG's enhancement network)."""
from .unet import EnhancementUNet, degrade, enhance, load_enhancer

__all__ = ["EnhancementUNet", "degrade", "enhance", "load_enhancer"]
