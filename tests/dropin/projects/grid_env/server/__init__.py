"""The grid world's server: its environments and its app."""
