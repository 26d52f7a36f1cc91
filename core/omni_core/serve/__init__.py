"""The serving layer: ``omni serve`` (command.py), the FastAPI app over an ``Omni`` runtime
(app.py and one module per endpoint family), and what they share with the offline API: entry
payloads (inputs.py), audio codecs, saved voices, checkpoint resolution."""
