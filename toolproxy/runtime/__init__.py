"""How a toolproxy process runs, whatever it does: its garbage collector's policy, its event
loop, the helper processes it starts. Below every other folder: the parsers, the proxy, the live
page and the analyzer all use it, and it uses none of them."""
