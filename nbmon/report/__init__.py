"""What a run or a cell comes to, for people and for DataFrames: the
summary (calibrax's ``ResourceSummary``, :mod:`.summary`), the record of one
monitored cell and the DataFrames of history and samples (:mod:`.records`),
and static tables and timeline pictures (:mod:`.render`)."""
