"""cryptotrain: a Keras/TensorFlow multi-model batch trainer for crypto price forecasters."""
__version__ = "0.1.0"
