"""The model: its layers, how it is built and counted, the device it trains on, training and resume."""
