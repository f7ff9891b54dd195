"""Speech engines: audio decoding and encoding (PyAV), Whisper transcription, text to speech."""
