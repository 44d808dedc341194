"""To come: see the project's issues."""
