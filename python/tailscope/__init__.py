"""tailscope: why was that request slow?

Python side: load a recording (meta.json + requests/*.parquet), rank the kernel events that
cause tail latency (VarMRI), and render an HTML report and a terminal summary.
"""

__version__ = "0.1.0"
