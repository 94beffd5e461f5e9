"""The built-in image task: class-folder PNG/JPEG images, a small CNN, per-image drift statistics."""
