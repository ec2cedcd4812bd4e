"""serve.py's server: the continuous-batching engine (engine.py), OpenAI's API over it (app.py, schema.py,
text.py), the chat page (page.html) and the command line (cli.py)."""
