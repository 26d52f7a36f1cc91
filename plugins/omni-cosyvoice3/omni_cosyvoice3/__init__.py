"""Fun-CosyVoice3 for omni: frontend -> llm (AR) =tokens=> flow (chunked CFM) =mel=> hift -> audio."""
