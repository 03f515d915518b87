"""What a finished job leaves: its artifacts, model cards, the Hub, and predicting from it."""
