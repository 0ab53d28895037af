"""The surfaces as they reach us and as we reach them: Telegram updates and the Bot API, Twilio's
WhatsApp forms and REST API, live replies, media downloads, message splitting.
"""
