"""The drift check: the champion's reference data against newly arrived data, and the alert it publishes."""
