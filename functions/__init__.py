# Where a request's arrival at the instance is kept (`time.monotonic()`): main.py stamps it before
# importing the surface's modules, so that a cold start's seconds of imports count toward a
# platform's wait (Twilio's 15 s for its TwiML answer: functions/twilio.py). Nothing else lives here:
# main.py imports it before anything else is loaded.
ARRIVED = "crossmem.arrived"
