#!/bin/bash
sed -i 's/report\["directories"\]/report["files"]/' /app/report.py
