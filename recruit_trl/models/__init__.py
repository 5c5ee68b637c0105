"""Models: the tiny model built here, SmolLM2 from its wheel, loading for training and inference, and sampling."""
