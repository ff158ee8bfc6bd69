"""GPTBigCode model, checkpoint loading and the embedded default checkpoint."""
