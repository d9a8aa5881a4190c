"""What runs a harness through the proxy: `run` (one harness command), `study` (a matrix of
conditions), `replay` (recorded requests sent again), `demo` (an emulated stack and agent), and the
client environment (`harness`) that points any common client at the proxy."""
