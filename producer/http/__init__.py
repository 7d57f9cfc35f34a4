"""The HTTP route (`vela2 http`): the app assembled in `app`, one module per route family in
`routes/`, the response models in `models`."""
