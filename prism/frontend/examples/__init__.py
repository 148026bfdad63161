"""Small PyTorch models used by the frontend's tests, its speed script and ``prism optimize`` examples."""
