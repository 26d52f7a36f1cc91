"""The serving layer: ``omni serve`` (command.py) and the FastAPI app over an ``Omni`` runtime
(app.py and one module per endpoint family). What it shares with the offline API (entry
payloads, audio codecs, saved voices, checkpoint resolution) is in ``omni_core.surface``."""
