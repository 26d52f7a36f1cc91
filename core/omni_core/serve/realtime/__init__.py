"""The server's WebSocket endpoints: ``/v1/audio/speech/stream`` (text in as it is written,
speech out sentence by sentence) and ``/v1/realtime`` (OpenAI's Realtime API: transcription,
speech and conversation sessions, picked by the served family's tasks in ``endpoint``).
``sockets`` holds what both share: the API key, admission, the idle timeout and error events."""
