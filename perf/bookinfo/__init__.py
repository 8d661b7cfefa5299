"""A Bookinfo-shaped application written for this project (see README.md)."""
