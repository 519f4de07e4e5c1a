"""Files and streams that keras_cait writes.

    atomic   `written_atomically`, `write_text`: a file or folder appears whole or not at all
             (exports, run records, figures, downloads), and what killed writers left is removed
"""
