"""What both sides use, shipped to hosts with the agent (stdlib only): secrets redaction, untrusted text made
printable, the signals that stop orch, and the chain model of speculative acceptance.
"""

__all__ = ["acceptance", "printable", "redaction", "stopsignals"]
