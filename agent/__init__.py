"""The serve.zone relay-side restore agent.

Nothing is imported here on purpose: `import agent` must stay cheap and side-effect free.
"""

__version__ = "0.1.0"
