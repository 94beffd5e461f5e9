"""One Functions blueprint per trigger family; each handler parses, decides through the front door, and
delegates. The logic lives in function_app/service.py, where it is tested without a Functions host."""
