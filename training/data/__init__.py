"""Task-agnostic data handling: raw file listing and fingerprints, stable splits, and publishing a version."""
