"""The paper's figures and tables from the records: Fig. 5 (``fig5``, its curves, table and gap in
``curves``), Fig. 6 (``fig6``), Table IV (``table4``), the time breakdown (``breakdown``) and the
communication model against measurement (``commmodel``). Each is ``python -m analysis.figures.<name>``."""
