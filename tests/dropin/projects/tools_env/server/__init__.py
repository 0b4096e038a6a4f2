"""The tool environment's server."""
