import os

import pytest
import torch

# Two cores: keep each test process from oversubscribing them.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def mnist_test():
    from gradleak.data import DatasetSpec, load_dataset

    return load_dataset(DatasetSpec("mnist", split="test"))
