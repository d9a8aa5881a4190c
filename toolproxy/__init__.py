"""toolproxy: record what tool-using agents and serving stacks really say to each other."""

__version__ = "0.1.0"
