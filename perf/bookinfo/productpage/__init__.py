"""productpage: the front service of the Bookinfo-shaped application."""
