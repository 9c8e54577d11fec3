"""What the offline pages are drawn with: SVG charts and the shared page parts."""
