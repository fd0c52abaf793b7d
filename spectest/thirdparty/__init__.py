"""Third-party servers spectest is tested against (llama.cpp's llama-server)."""
