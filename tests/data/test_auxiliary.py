"""Synthetic and public auxiliary images: what an honest server without the client's data starts from."""
import pytest
import torch

from gradleak.data.auxiliary import pen_strokes, public_images
from gradleak.errors import GradleakError


def test_pen_strokes_are_thin_centred_strokes_drawn_from_the_generator():
    images = pen_strokes((1, 28, 28), 200, torch.Generator().manual_seed(0))
    assert images.shape == (200, 1, 28, 28) and images.min() >= 0 and images.max() <= 1
    ink = (images > 0.5).float().mean((1, 2, 3))
    # strokes, not fills or blanks: every image has ink, none is mostly ink
    assert ink.min() > 0.01 and ink.max() < 0.6
    # drawn inside the central five sevenths (plus the pen's radius): the outer pixels are empty
    assert images[..., 0, :].max() == 0 and images[..., -1, :].max() == 0
    assert images[..., 0].max() == 0 and images[..., -1].max() == 0
    assert torch.equal(images, pen_strokes((1, 28, 28), 200, torch.Generator().manual_seed(0)))
    assert not torch.equal(images, pen_strokes((1, 28, 28), 200, torch.Generator().manual_seed(1)))
    colour = pen_strokes((3, 32, 32), 4, torch.Generator().manual_seed(0))
    assert colour.shape == (4, 3, 32, 32) and torch.equal(colour[:, 0], colour[:, 2])


@pytest.mark.parametrize("make", [pen_strokes, public_images])
def test_refuse_a_shape_that_is_not_an_image(make):
    with pytest.raises(GradleakError, match="not \\(C, H, W\\)"):
        make((784,), 2, torch.Generator().manual_seed(0))
