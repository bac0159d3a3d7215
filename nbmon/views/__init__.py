"""Views (runs where the session runs: the helper process, or the kernel with
``--session kernel``): the live chart, the cell's meter, records and their
timelines, the static pages -- widgets and pictures, with their JavaScript
(``js/``). The kernel only relays their comm traffic."""
