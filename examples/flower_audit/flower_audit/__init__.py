"""A Flower app audited by gradleak: FedAvg of a small CNN over non-IID MNIST clients."""
