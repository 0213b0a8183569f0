"""Feature inversion (gradleak.solvers.features): the starts of the sigmoid-pixel inversion."""
import torch

from gradleak.data import DatasetSpec, load_dataset
from gradleak.models import ModelSpec, build_model
from gradleak.solvers.features import FeatureExtractor, FeatureInversionOptions, invert_features


def _psnr(images, x):
    return -10 * torch.log10((images - x).pow(2).flatten(1).mean(1))


def test_dark_and_bright_starts_escape_a_first_layer_dead_on_gray():
    # lenet5 (ReLU) seeds 17 and 3: conv1's positive-bias kernels sum negative, so they are dead
    # on a mid-gray background, which then gets no gradient. The true features entering fc120 of
    # six MNIST digits, 300 steps: from gray alone 4.4-5.7 dB (seed 17) and 9.0-10.8 dB (seed 3);
    # from gray, dark and bright, the best kept per image, 13.2-23.8 and 17.2-23.6 dB (seed 104,
    # not trapped: 14.4-16.3 from gray, 16.8-24.3 from the three).
    mnist = load_dataset(DatasetSpec("mnist", split="test"))
    x = mnist.inputs[:6]
    for seed in (17, 3):
        extract = FeatureExtractor(build_model(ModelSpec("lenet5", (1, 28, 28), 10, seed=seed, activation="relu")), "7")
        targets = extract(x).detach()
        runs = {}
        for starts in ((0.0,), (0.0, -3.0, 3.0)):
            options = FeatureInversionOptions(300, 0.05, 0.1, "sigmoid", starts=starts)
            runs[starts] = _psnr(invert_features(extract, targets, (1, 28, 28), options,
                                                 generator=torch.Generator().manual_seed(0)), x)
        assert float(runs[(0.0,)].max()) < 11.5, (seed, runs)
        assert float(runs[(0.0, -3.0, 3.0)].min()) > 12.0, (seed, runs)
