"""llmslo: SLO, latency, cache, drift and cost monitoring for self-hosted LLM serving."""

__version__ = "0.1.0"
