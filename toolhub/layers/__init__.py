"""The channel layer: how processes hand each other stream events, through Redis.

- `redis_layer`: `RedisLayer`, channels-redis's layer with the same keys and rules and
  its sends in fewer round trips (`CHANNEL_LAYERS` `BACKEND`
  `toolhub.layers.redis_layer.RedisLayer` when `REDIS_URL` is set; without it, Channels'
  in-memory layer).

Code reaches the layer through `channels.layers.get_channel_layer()`, never by importing
this package; it imports nothing from `toolhub` or `apps`.
"""
