"""The HTTP route (`vela2 http`): the app assembled in `app` (create_app, serve, main), one module per
route family in `routes/`, the response models in `models`, the app's settings and Redis clients in
`state`, the routes' dependencies in `deps`, shared responses in `responses` and `body`, the
arguments and uvicorn's protocol in `server`."""
