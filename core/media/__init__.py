"""What people send besides text: photos, PDFs, voice notes."""
