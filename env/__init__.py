"""Environments for recruit_trl, one package each: ``env.clinical`` (clinical-trial recruitment) and ``env.conquest``
(the board game). ``env.server`` and ``env.client`` serve and reach them over HTTP / WebSocket."""
