import pytest
import torch

# Quality thresholds hold on one thread whatever the host: reduction order, and with it an
# optimisation's path, depends on the thread count.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread_and_private_rng():
    # A test that changes the thread count or the global generator (a user's app seeding
    # torch, say) must not change the tests that run after it.
    with torch.random.fork_rng(devices=[]):
        yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def mnist_test():
    from gradleak.data import DatasetSpec, load_dataset

    return load_dataset(DatasetSpec("mnist", split="test"))


@pytest.fixture(scope="session")
def mnist_train():
    from gradleak.data import DatasetSpec, load_dataset

    return load_dataset(DatasetSpec("mnist", split="train"))


@pytest.fixture(scope="session")
def news():
    """The news corpus's test split at 16 and 32 tokens per sequence (the text tests)."""
    from gradleak.data import DatasetSpec, load_dataset

    return {seq_len: load_dataset(DatasetSpec("news", split="test", seq_len=seq_len)) for seq_len in (16, 32)}
