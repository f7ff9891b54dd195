"""Models on this machine's disk: getting them from the Hugging Face Hub (`pull.py`), listing
and removing them (`inventory.py`)."""
