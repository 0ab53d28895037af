"""How we reach the platforms: Telegram's Bot API and live replies, Twilio's signatures, TwiML and
REST API, media downloads, message splitting. What an inbound message says is read in each
surface's module (core/surfaces/).
"""
